# The chart of `tensorpar bench all --png FILE`: forward-pass speedup against
# TP size.  The bench command embeds this file at build time (CMake turns it
# into a C string, so the installed binary needs no data file) and runs it
# with gnuplot after these variables, which it defines first:
#   term   the terminal: pngcairo, or png as the fallback
#   out    the PNG to write
#   data   the data file: "tp speedup oversubscribed(0|1)" per line
#   model  the model's name;  seq  the sequence length
#   r11    TP=2 x 1 thread over TP=1 x 1;  r12  TP=2 x 1 over TP=1 x 2 threads
#   max_tp the largest TP size measured;  cores  the CPU's cores
#   ymax   the top of the y axis (room for the value labels)
set terminal @term size 800,520
set output out
set title sprintf("forward pass speedup against TP size: %s, seq %d, 1 thread per rank\nTP=2 x 1 is %.2fx TP=1 x 1 and %.2fx TP=1 x 2 threads", model, seq, r11, r12)
set xlabel 'TP size (ranks)'
set ylabel 'speedup over TP=1 x 1 thread'
set xrange [0.5:max_tp + 0.5]
set yrange [0:ymax]
set xtics 1
set grid
set key outside bottom center horizontal
set style fill solid 0.6
set boxwidth 0.5
# Beyond the cores, ranks share a core: the ideal line flattens there.
set arrow from cores + 0.5, graph 0 to cores + 0.5, graph 1 nohead dt 2 lc rgb 'gray40'
set label sprintf("more ranks than\nthe %d cores:\noversubscribed", cores) at cores + 0.6, graph 0.9 tc rgb 'gray30'
plot data using 1:($3 == 0 ? $2 : 1/0) with boxes lc rgb '#3070b0' title 'measured', \
     '' using 1:($3 == 1 ? $2 : 1/0) with boxes lc rgb '#c05050' title 'measured (oversubscribed)', \
     '' using 1:2:(sprintf('%.2fx', $2)) with labels offset 0,0.8 notitle, \
     [x=1:max_tp] (x < cores ? x : cores) with lines dt 3 lc rgb 'black' title 'ideal (one core per rank)'
