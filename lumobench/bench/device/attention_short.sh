# The attention benchmark at other short-partition layouts (session 19, call 2): the module constants
# monkeypatched, every layout in its own process. Usage on the device: bash lumobench/bench/device/attention_short.sh $OUT
W=$1
for s in 256:16 128:32 64:64; do
  k=${s%:*}; n=${s#*:}
  timeout 100 python3 -c "
import sys, typer
from lumotree.verify.attention import decode as d
import lumobench.bench.attention as a
d.SHORT_KEYS = a.SHORT_KEYS = $k
d.SHORT_PARTITIONS = a.SHORT_PARTITIONS = $n
sys.argv = ['attention', '--out', '$W/attn-short$k', '--contexts', '4096,32768', '--no-drafter']
typer.run(a.attention_command)" > $W/attn-$k.log 2>&1
  echo "short $n x $k:"; grep -E "^\| BM" $W/attn-short$k/attention.md | head -2 || tail -3 $W/attn-$k.log
done
