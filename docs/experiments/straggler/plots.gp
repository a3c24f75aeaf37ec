# Regenerate with: gnuplot plots.gp (in this directory)
set datafile separator ','
set terminal pngcairo size 1100,700 font ',11' noenhanced
set grid
set key outside right
set ylabel 'test accuracy'
set yrange [0.6:0.95]
set output 'accuracy_vs_time.png'
set title 'Test accuracy against wall time (one line per run; a colour per configuration)'
set xlabel 'wall time (s)'
plot 'sync_w4_strag3-4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 1 title 'sync_w4_strag3-4', \
     'sync_w4_strag3-4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 1 notitle, \
     'sync_w4_strag3-4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 1 notitle, \
     'sync-backup1_w4_strag3-4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 2 title 'sync-backup1_w4_strag3-4', \
     'sync-backup1_w4_strag3-4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 2 notitle, \
     'sync-backup1_w4_strag3-4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 2 notitle, \
     'async_w4_strag3-4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 3 title 'async_w4_strag3-4', \
     'async_w4_strag3-4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 3 notitle, \
     'async_w4_strag3-4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 3 notitle, \
     'async-slr_w4_strag3-4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 4 title 'async-slr_w4_strag3-4', \
     'async-slr_w4_strag3-4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 4 notitle, \
     'async-slr_w4_strag3-4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 4 notitle, \
     'ssp-1_w4_strag3-4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 5 title 'ssp-1_w4_strag3-4', \
     'ssp-1_w4_strag3-4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 5 notitle, \
     'ssp-1_w4_strag3-4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 5 notitle, \
     'ssp-4_w4_strag3-4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 6 title 'ssp-4_w4_strag3-4', \
     'ssp-4_w4_strag3-4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 6 notitle, \
     'ssp-4_w4_strag3-4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 6 notitle, \
     'dcasgd_w4_strag3-4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 7 title 'dcasgd_w4_strag3-4', \
     'dcasgd_w4_strag3-4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 7 notitle, \
     'dcasgd_w4_strag3-4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 7 notitle, \
     0.8500 with lines dt 2 lc rgb 'gray40' title 'target'
set output 'accuracy_vs_updates.png'
set title 'Test accuracy against applied updates (shard version)'
set xlabel 'applied updates'
plot 'sync_w4_strag3-4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 1 title 'sync_w4_strag3-4', \
     'sync_w4_strag3-4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 1 notitle, \
     'sync_w4_strag3-4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 1 notitle, \
     'sync-backup1_w4_strag3-4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 2 title 'sync-backup1_w4_strag3-4', \
     'sync-backup1_w4_strag3-4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 2 notitle, \
     'sync-backup1_w4_strag3-4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 2 notitle, \
     'async_w4_strag3-4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 3 title 'async_w4_strag3-4', \
     'async_w4_strag3-4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 3 notitle, \
     'async_w4_strag3-4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 3 notitle, \
     'async-slr_w4_strag3-4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 4 title 'async-slr_w4_strag3-4', \
     'async-slr_w4_strag3-4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 4 notitle, \
     'async-slr_w4_strag3-4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 4 notitle, \
     'ssp-1_w4_strag3-4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 5 title 'ssp-1_w4_strag3-4', \
     'ssp-1_w4_strag3-4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 5 notitle, \
     'ssp-1_w4_strag3-4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 5 notitle, \
     'ssp-4_w4_strag3-4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 6 title 'ssp-4_w4_strag3-4', \
     'ssp-4_w4_strag3-4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 6 notitle, \
     'ssp-4_w4_strag3-4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 6 notitle, \
     'dcasgd_w4_strag3-4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 7 title 'dcasgd_w4_strag3-4', \
     'dcasgd_w4_strag3-4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 7 notitle, \
     'dcasgd_w4_strag3-4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 7 notitle
set output 'accuracy_vs_epochs.png'
set title 'Test accuracy against epochs (training examples behind the applied updates / 60,000)'
set xlabel 'epochs'
plot 'sync_w4_strag3-4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 1 title 'sync_w4_strag3-4', \
     'sync_w4_strag3-4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 1 notitle, \
     'sync_w4_strag3-4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 1 notitle, \
     'sync-backup1_w4_strag3-4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 2 title 'sync-backup1_w4_strag3-4', \
     'sync-backup1_w4_strag3-4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 2 notitle, \
     'sync-backup1_w4_strag3-4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 2 notitle, \
     'async_w4_strag3-4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 3 title 'async_w4_strag3-4', \
     'async_w4_strag3-4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 3 notitle, \
     'async_w4_strag3-4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 3 notitle, \
     'async-slr_w4_strag3-4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 4 title 'async-slr_w4_strag3-4', \
     'async-slr_w4_strag3-4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 4 notitle, \
     'async-slr_w4_strag3-4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 4 notitle, \
     'ssp-1_w4_strag3-4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 5 title 'ssp-1_w4_strag3-4', \
     'ssp-1_w4_strag3-4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 5 notitle, \
     'ssp-1_w4_strag3-4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 5 notitle, \
     'ssp-4_w4_strag3-4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 6 title 'ssp-4_w4_strag3-4', \
     'ssp-4_w4_strag3-4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 6 notitle, \
     'ssp-4_w4_strag3-4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 6 notitle, \
     'dcasgd_w4_strag3-4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 7 title 'dcasgd_w4_strag3-4', \
     'dcasgd_w4_strag3-4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 7 notitle, \
     'dcasgd_w4_strag3-4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 7 notitle
set output 'training_loss.png'
set title 'Training loss (mean over workers, 2 s bins)'
set xlabel 'wall time (s)'
set ylabel 'training loss'
set autoscale y
set logscale y
plot 'sync_w4_strag3-4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 1 title 'sync_w4_strag3-4', \
     'sync_w4_strag3-4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 1 notitle, \
     'sync_w4_strag3-4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 1 notitle, \
     'sync-backup1_w4_strag3-4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 2 title 'sync-backup1_w4_strag3-4', \
     'sync-backup1_w4_strag3-4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 2 notitle, \
     'sync-backup1_w4_strag3-4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 2 notitle, \
     'async_w4_strag3-4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 3 title 'async_w4_strag3-4', \
     'async_w4_strag3-4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 3 notitle, \
     'async_w4_strag3-4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 3 notitle, \
     'async-slr_w4_strag3-4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 4 title 'async-slr_w4_strag3-4', \
     'async-slr_w4_strag3-4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 4 notitle, \
     'async-slr_w4_strag3-4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 4 notitle, \
     'ssp-1_w4_strag3-4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 5 title 'ssp-1_w4_strag3-4', \
     'ssp-1_w4_strag3-4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 5 notitle, \
     'ssp-1_w4_strag3-4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 5 notitle, \
     'ssp-4_w4_strag3-4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 6 title 'ssp-4_w4_strag3-4', \
     'ssp-4_w4_strag3-4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 6 notitle, \
     'ssp-4_w4_strag3-4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 6 notitle, \
     'dcasgd_w4_strag3-4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 7 title 'dcasgd_w4_strag3-4', \
     'dcasgd_w4_strag3-4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 7 notitle, \
     'dcasgd_w4_strag3-4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 7 notitle
unset logscale y
set output 'staleness.png'
set terminal pngcairo size 1100,1040 font ',10' noenhanced
set multiplot layout 4,2 title 'Staleness of applied pushes (all shards; first seed)'
unset key
set style fill solid 0.6
set boxwidth 0.9
set xlabel 'staleness (versions)'
set ylabel 'share of pushes'
set title 'sync_w4_strag3-4'
set autoscale
stats 'sync_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'sync_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'sync-backup1_w4_strag3-4'
set autoscale
stats 'sync-backup1_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'sync-backup1_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'async_w4_strag3-4'
set autoscale
stats 'async_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'async_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'async-slr_w4_strag3-4'
set autoscale
stats 'async-slr_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'async-slr_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'ssp-1_w4_strag3-4'
set autoscale
stats 'ssp-1_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'ssp-1_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'ssp-4_w4_strag3-4'
set autoscale
stats 'ssp-4_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'ssp-4_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'dcasgd_w4_strag3-4'
set autoscale
stats 'dcasgd_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'dcasgd_w4_strag3-4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
unset multiplot
