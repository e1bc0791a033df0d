# The loss chart that training writes at the end (src/train/train_log.c):
# training loss, and evaluation loss when there is one, against the step.
# CMake embeds this file in the library as a C string; train_log.c runs it
# with gnuplot after defining these variables:
#   term      the terminal: pngcairo, or png as the fallback
#   out       the PNG to write
#   data      "step loss" per line, the training loss
#   eval_data "step eval_loss" per line;  has_eval  1 when it has lines
#   steps     the last step logged
set terminal @term size 800,500
set output out
set title sprintf("loss against step (%d steps)", steps)
set xlabel 'step'
set ylabel 'loss'
set grid
set key top right
set xrange [0:steps > 1 ? steps + 1 : 2]
if (has_eval) {
    plot data using 1:2 with lines lw 2 lc rgb '#3070b0' title 'training loss', \
         eval_data using 1:2 with linespoints pt 7 lw 2 lc rgb '#c05050' title 'eval loss'
} else {
    plot data using 1:2 with lines lw 2 lc rgb '#3070b0' title 'training loss'
}
