# Sourced by the step scripts (step07/08/09_check.sh, change_check.sh): compute-sanitizer's
# three tools on one test program's GPU tests, all three at once (they are CPU-bound; the
# machine has 16 cores), and the SASS facts of a step's kernels.
#   sanitize NAME EXE LOGDIR [TIMEOUT]
#       memcheck and synccheck with FA_TEST_QUICK=1, racecheck with FA_TEST_QUICK=2
#       (fewer shapes: it is the slowest), each into LOGDIR/san-TOOL-NAME.log and killed
#       after TIMEOUT seconds (300); a line for each as it ends.
#   sanitizer_lines NAME LOGDIR
#       the three lines a step's test0X.txt keeps: each tool's test summary and its
#       ERROR or RACECHECK SUMMARY.
#   sass_counts LIB OPCODE...
#       per kernel of LIB (cuobjdump --dump-sass), how many instructions match each OPCODE
#       (an awk pattern: HGMMA, UTMALDG, 'LDL|STL'), a line a kernel, sorted.
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

sass_counts() {
  local lib=$1; shift
  cuobjdump --dump-sass "$lib" |
    awk -v ops="$*" 'BEGIN { n = split(ops, op, " ") }
      /Function :/ { f = $3; seen[f] = 1; next }
      { for (i = 1; i <= n; i++) if ($0 ~ op[i]) c[f, i]++ }
      END { for (k in seen) { s = k ":"; for (i = 1; i <= n; i++) { w = op[i]; gsub(/\|/, "/", w)
              s = s sprintf("%s %d %s", i > 1 ? "," : "", c[k, i], w) }; print s } }' |
    (c++filt 2>/dev/null || cat) |
    sed -E 's/fa::step0[0-9]::\(anonymous namespace\):://; s/__nv_bfloat16/bf16/g; s/__half/fp16/g; s/\(CUtensorMap_st[^)]*\)//' | sort
}
