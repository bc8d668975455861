# shellcheck shell=bash
# The part runner the real-GPU check scripts share (sourced; needs $OUT): each part's output
# goes to $OUT/parts/NAME.log, its result lines and time to $OUT/summary.txt, and $fails
# counts the parts that failed. SKIP="a b" names parts not to run.
#
#   ONLY="a b" names the only parts to run (the others are skipped), safer for a device call
#   than a SKIP list that a newly added part is missing from.
#
#   . scripts/lib-check-parts.sh
#   part NAME COMMAND...     runs COMMAND as part NAME (skipped if SKIP names it)
#   skipped NAME             true (and says so) when SKIP names NAME or ONLY leaves it out
#   is_skipped NAME          the same, silently
#   say TEXT / pass WHAT / fail WHAT WHY
mkdir -p "$OUT/parts"
summary="$OUT/summary.txt"
: > "$summary"
fails=0
SKIP=" ${SKIP:-} "
ONLY=" ${ONLY:-} "
# The lines of a part's log that the summary keeps.
# (skip: a case a smaller GPU cannot run, counted as not run; SUMMARY: estimate34b's totals.)
PART_RESULT_LINES=${PART_RESULT_LINES:-'^(PASS|FAIL|ok|MISMATCH|score|cause|fix|median|ratio|status|ps |recall|false|figure|skip|SUMMARY)'}

say() { echo "$*" | tee -a "$summary"; }
pass() { say "PASS $1"; }
fail() {
  say "FAIL $1: $2"
  fails=$((fails + 1))
}
# True when SKIP names NAME or ONLY leaves it out; says nothing.
is_skipped() { [[ $SKIP == *" $1 "* ]] || [[ $ONLY != "  " && $ONLY != *" $1 "* ]]; }
skipped() {
  if [[ $SKIP == *" $1 "* ]]; then
    say "== $1: skipped (SKIP)"
  elif [[ $ONLY != "  " && $ONLY != *" $1 "* ]]; then
    say "== $1: skipped (not in ONLY)"
  else
    return 1
  fi
}
part() {
  local name=$1 t0 rc ms
  shift
  skipped "$name" && return
  say "== $name"
  mkdir -p "$OUT/parts/$name"
  t0=$(date +%s%N)
  "$@" > "$OUT/parts/$name.log" 2>&1
  rc=$?
  grep -E "$PART_RESULT_LINES" "$OUT/parts/$name.log" | head -60 | tee -a "$summary"
  ms=$((($(date +%s%N) - t0) / 1000000))
  say "time $name: $((ms / 1000)).$((ms % 1000 / 100)) s"
  if [ "$rc" = 0 ]; then pass "$name (exit 0)"; else fail "$name" "exit $rc, see parts/$name.log"; fi
}
