# Regenerate with: gnuplot plots.gp (in this directory)
set datafile separator ','
set terminal pngcairo size 1100,700 font ',11' noenhanced
runs = 'sync_w4_strag3-4 sync-backup1_w4_strag3-4 async_w4_strag3-4 async-slr_w4_strag3-4 ssp-1_w4_strag3-4 ssp-4_w4_strag3-4 dcasgd_w4_strag3-4'
t0s = '1795334146.471 1795334206.897 1795334267.273 1795334327.617 1795334387.982 1795334448.286 1795334508.639 '
set grid
set key outside right
set ylabel 'test accuracy'
set yrange [0.6:0.92]
set output 'accuracy_vs_time.png'
set title 'Test accuracy against wall time'
set xlabel 'wall time (s)'
plot for [i=1:words(runs)] word(runs,i).'/evaluator.csv' every ::1 \
     using ($1-word(t0s,i)):4 with lines lw 2 title word(runs,i), \
     0.8500 with lines dt 2 lc rgb 'gray40' title 'target'
set output 'accuracy_vs_updates.png'
set title 'Test accuracy against applied updates (shard version)'
set xlabel 'applied updates'
plot for [i=1:words(runs)] word(runs,i).'/evaluator.csv' every ::1 \
     using 2:4 with lines lw 2 title word(runs,i)
set output 'training_loss.png'
set title 'Training loss (mean over workers, 2 s bins)'
set xlabel 'wall time (s)'
set ylabel 'training loss'
set autoscale y
set logscale y
plot for [i=1:words(runs)] word(runs,i).'/train_loss.csv' every ::1 using 1:2 with lines lw 2 title word(runs,i)
unset logscale y
set output 'staleness.png'
set terminal pngcairo size 1100,1040 font ',10' noenhanced
set multiplot layout 4,2 title 'Staleness of applied gradients (all shards)'
unset key
set style fill solid 0.6
set boxwidth 0.9
set xlabel 'staleness (versions)'
set ylabel 'share of pushes'
do for [i=1:words(runs)] {
  set title word(runs,i)
  set autoscale
  stats word(runs,i).'/staleness.csv' every ::1 using 1:2 nooutput
  total = STATS_sum_y
  set xrange [-0.5:(STATS_max_x < 4 ? 4 : STATS_max_x) + 0.5]
  set yrange [0:1]
  plot word(runs,i).'/staleness.csv' every ::1 using 1:($2/total) with boxes
}
unset multiplot
