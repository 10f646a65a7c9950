# ncu of one 27B attention layer at 4K (AR and the paper tree, eager) and the split-K kernel's layouts
# on this machine's Triton (session 19, call 8). Usage on the device: bash lumobench/bench/device/ncu_attention.sh $OUT
W=$1
DIAG_TTGIR=1 timeout 60 python3 lumobench/bench/device/attention_diag.py > $W/attn-ttgir.log 2>&1
timeout 200 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats -k regex:tree_attention --launch-skip 0 python3 lumobench/bench/device/attention_diag.py > $W/ncu-attn.txt 2> $W/ncu-attn.err
