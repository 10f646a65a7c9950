# Sourced by the A/B scripts. An arm is "head" (the working tree, labelled LUMOBENCH_COMMIT) or the
# name of a revision staged under .stage/NAME/serving (labelled by .stage/NAME/COMMIT).

# start_arms: exit 2 naming the first arm of ORDER (default "base head") that is neither head nor
# staged; else the device's environment (the carried wheels, no interpreter) and $OUT
start_arms() {
    local arm
    for arm in ${ORDER:-base head}; do
        [[ $arm == head || -d .stage/$arm/serving ]] || {
            echo "no revision staged under .stage/$arm/serving (see the first lines of this script)" >&2
            exit 2
        }
    done
    export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
    source lumobench/bench/device/carried_wheels.sh
    mkdir -p "$OUT"
}

# run_arms NAME SECONDS PATTERN ARGS...: for each arm of ORDER (default "base head"), in order,
# `python3 -m lumobench.bench.NAME --out $OUT/NAME-ARM-n ARGS...` under that arm's PYTHONPATH and
# label, at most SECONDS, its log beside it ($OUT/NAME-ARM-n.log); prints each run's first log line
# and its NAME.md lines matching PATTERN (or the log's tail)
run_arms() {
    local name=$1 seconds=$2 pattern=$3 arm path commit dest run=0
    shift 3
    for arm in ${ORDER:-base head}; do
        run=$((run + 1))
        path=$PYTHONPATH
        commit=${LUMOBENCH_COMMIT:-}
        if [[ $arm != head ]]; then
            path=$PWD/.stage/$arm/serving:$PYTHONPATH
            commit=$(cat ".stage/$arm/COMMIT" 2>/dev/null || echo "staged as $arm")
        fi
        dest="$OUT/$name-$arm-$run"
        PYTHONPATH=$path python3 -c "import lumotree; print('lumotree from', lumotree.__file__)" > "$dest.log"
        LUMOBENCH_COMMIT=$commit PYTHONPATH=$path timeout "$seconds" python3 -m "lumobench.bench.$name" \
            --out "$dest" "$@" >> "$dest.log" 2>&1
        echo "$arm (run $run, $commit): $(head -1 "$dest.log")"
        grep -E "$pattern" "$dest/$name.md" 2>/dev/null | head -8 || tail -5 "$dest.log"
    done
}
