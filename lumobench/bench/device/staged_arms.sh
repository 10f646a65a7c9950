# Sourced by the A/B scripts. An arm is "head" (the working tree, labelled LUMOBENCH_COMMIT) or the
# name of a revision staged under .stage/NAME/serving (labelled by .stage/NAME/COMMIT).

# require_staged NAME...: exit 2 naming the first arm that is neither head nor staged
require_staged() {
    local arm
    for arm in "$@"; do
        [[ $arm == head || -d .stage/$arm/serving ]] || {
            echo "no revision staged under .stage/$arm/serving (see the first lines of this script)" >&2
            exit 2
        }
    done
}

# staged_arm NAME: set `path` (the arm's PYTHONPATH) and `commit` (its results' label)
staged_arm() {
    path=$PYTHONPATH
    commit=${LUMOBENCH_COMMIT:-}
    [[ $1 == head ]] && return 0
    path=$PWD/.stage/$1/serving:$PYTHONPATH
    commit=$(cat ".stage/$1/COMMIT" 2>/dev/null || echo "staged as $1")
}
