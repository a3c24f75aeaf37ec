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
plot 'async_w4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 1 title 'async_w4', \
     'async_w4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 1 notitle, \
     'async_w4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 1 notitle, \
     'easgd-4_w4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 2 title 'easgd-4_w4', \
     'easgd-4_w4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 2 notitle, \
     'easgd-4_w4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 2 notitle, \
     'local-8_w4_seed1/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 3 title 'local-8_w4', \
     'local-8_w4_seed2/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 3 notitle, \
     'local-8_w4_seed3/accuracy.csv' every ::1 using 1:4 with lines lw 1.5 lc 3 notitle, \
     0.8500 with lines dt 2 lc rgb 'gray40' title 'target'
set output 'accuracy_vs_updates.png'
set title 'Test accuracy against applied updates (shard version)'
set xlabel 'applied updates'
plot 'async_w4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 1 title 'async_w4', \
     'async_w4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 1 notitle, \
     'async_w4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 1 notitle, \
     'easgd-4_w4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 2 title 'easgd-4_w4', \
     'easgd-4_w4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 2 notitle, \
     'easgd-4_w4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 2 notitle, \
     'local-8_w4_seed1/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 3 title 'local-8_w4', \
     'local-8_w4_seed2/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 3 notitle, \
     'local-8_w4_seed3/accuracy.csv' every ::1 using 2:4 with lines lw 1.5 lc 3 notitle
set output 'accuracy_vs_epochs.png'
set title 'Test accuracy against epochs (training examples behind the applied updates / 60,000)'
set xlabel 'epochs'
plot 'async_w4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 1 title 'async_w4', \
     'async_w4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 1 notitle, \
     'async_w4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 1 notitle, \
     'easgd-4_w4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 2 title 'easgd-4_w4', \
     'easgd-4_w4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 2 notitle, \
     'easgd-4_w4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 2 notitle, \
     'local-8_w4_seed1/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 3 title 'local-8_w4', \
     'local-8_w4_seed2/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 3 notitle, \
     'local-8_w4_seed3/accuracy.csv' every ::1 using 3:4 with lines lw 1.5 lc 3 notitle
set output 'training_loss.png'
set title 'Training loss (mean over workers, 2 s bins)'
set xlabel 'wall time (s)'
set ylabel 'training loss'
set autoscale y
set logscale y
plot 'async_w4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 1 title 'async_w4', \
     'async_w4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 1 notitle, \
     'async_w4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 1 notitle, \
     'easgd-4_w4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 2 title 'easgd-4_w4', \
     'easgd-4_w4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 2 notitle, \
     'easgd-4_w4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 2 notitle, \
     'local-8_w4_seed1/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 3 title 'local-8_w4', \
     'local-8_w4_seed2/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 3 notitle, \
     'local-8_w4_seed3/train_loss.csv' every ::1 using 1:2 with lines lw 1.5 lc 3 notitle
unset logscale y
set output 'staleness.png'
set terminal pngcairo size 1100,520 font ',10' noenhanced
set multiplot layout 2,2 title 'Staleness of applied pushes (all shards; first seed)'
unset key
set style fill solid 0.6
set boxwidth 0.9
set xlabel 'staleness (versions)'
set ylabel 'share of pushes'
set title 'async_w4'
set autoscale
stats 'async_w4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'async_w4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'easgd-4_w4'
set autoscale
stats 'easgd-4_w4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'easgd-4_w4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
set title 'local-8_w4'
set autoscale
stats 'local-8_w4_seed1/staleness.csv' every ::1 using 1:2 nooutput
total = STATS_sum_y
set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
set yrange [0:1]
plot 'local-8_w4_seed1/staleness.csv' every ::1 using 1:($2/total) with boxes
unset multiplot
