#!/usr/bin/env bash
# Before/after in one run: the same bench scripts, alternating between two checkouts
# (each with a .venv from `make install`, or a link to one: PYTHONPATH is set to the
# checkout, so its code runs, brokers included), so that both see the same machine.
#   bash bench/ab.sh BEFORE_DIR AFTER_DIR [REPS] > ab.log
#   ONLY="P1 C1 L1" bash bench/ab.sh ...   (a subset of: P1 P2 C1 C2 L1 Spark)
# Prints each figure's line prefixed with the side; compare ratios within the run.
set -u
before=$1 after=$2 reps=${3:-2}
only=" ${ONLY:-P1 P2 C1 C2 L1 Spark} "
run() {  # side dir label cmd...
  local side=$1 dir=$2 label=$3; shift 3
  [[ "$only" == *" ${label%% *} "* ]] || return 0
  echo "### $side $label"
  (cd "$dir" && PYTHONPATH="$dir" timeout 600 .venv/bin/python "$@" 2>&1 | grep -vE '^\s*$|WARN|log4j|Setting default log level|SparkContext|^\[Stage' | tail -12)
}
for r in $(seq "$reps"); do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    run "$side" "$dir" "P1 (rep $r)" bench/bench_produce.py --flush sync --front sync --workloads P1
    run "$side" "$dir" "P2 (rep $r)" bench/bench_produce.py --flush sync --front sync --workloads P2
    run "$side" "$dir" "C1 (rep $r)" bench/bench_consume.py --only c1s
    run "$side" "$dir" "C2 (rep $r)" bench/bench_consume.py --only c2
    run "$side" "$dir" "L1 (rep $r)" bench/bench_consume.py --only l1 --flush async
    run "$side" "$dir" "Spark drain (rep $r)" bench/bench_spark.py --runs 2
  done
done
