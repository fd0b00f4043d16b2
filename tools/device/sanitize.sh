# Sourced by the step scripts (step07/08/09_check.sh): compute-sanitizer's three tools on
# one test program's GPU tests, all three at once (they are CPU-bound; the machine has
# 16 cores).
#   sanitize NAME EXE LOGDIR [TIMEOUT]
#       memcheck and synccheck with FA_TEST_QUICK=1, racecheck with FA_TEST_QUICK=2
#       (fewer shapes: it is the slowest), each into LOGDIR/san-TOOL-NAME.log and killed
#       after TIMEOUT seconds (300); a line for each as it ends.
#   sanitizer_lines NAME LOGDIR
#       the three lines a step's test0X.txt keeps: each tool's test summary and its
#       ERROR or RACECHECK SUMMARY.
sanitize() {
  local name=$1 exe=$2 logs=$3 limit=${4:-300} tool
  for tool in memcheck racecheck synccheck; do
    ( q=1; [ $tool = racecheck ] && q=2
      FA_TEST_QUICK=$q timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 9 "$exe" --gpu "[gpu]" \
        >"$logs/san-$tool-$name.log" 2>&1
      echo "$tool $name rc=$? $(grep -hE 'SUMMARY|passed|failed' "$logs/san-$tool-$name.log" | tr '\n' ' ')" ) &
  done
  wait
}

sanitizer_lines() {
  local name=$1 logs=$2 tool
  for tool in memcheck racecheck synccheck; do
    echo "compute-sanitizer --tool $tool (FA_TEST_QUICK): $(grep -h -E 'All tests passed|test cases' "$logs/san-$tool-$name.log" | head -1); $(grep -h SUMMARY "$logs/san-$tool-$name.log" | sed 's/=* *//')"
  done
}
