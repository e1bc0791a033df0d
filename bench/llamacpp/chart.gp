# The chart of bench/llamacpp/run.sh: tensorpar's speed over llama.cpp's, one
# bar per dtype, test and tensorpar configuration (the median over the
# rounds), with the rounds' range as an error bar and the line of parity.
# compare.py defines before it: term (pngcairo, or png as the fallback), out
# (the PNG), data ("label median min max" per line), title_text.
set terminal @term size 1000,560 noenhanced
set output out
set title title_text
set ylabel 'tensorpar tokens/s / llama.cpp tokens/s'
set yrange [0:*]
set offsets 0, 0, graph 0.1, 0   # room above the tallest bar for its label
set grid ytics
set style fill solid 0.6
set boxwidth 0.6
set xtics rotate by -35 left font ',9'
set bmargin 8
unset key
plot data using 0:2:xtic(1) with boxes lc rgb '#3070b0', \
     '' using 0:2:3:4 with yerrorbars lc rgb 'black' pt 0, \
     '' using 0:2:(sprintf('%.2f', $2)) with labels offset 0,0.8 font ',9', \
     1 with lines dt 2 lc rgb 'gray30'
