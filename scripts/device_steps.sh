# Sourced by scripts/device_env.sh (scripts/device_visit.sh sources that): how a visit records a
# step in $out/NAME.txt (the command, what it printed, its exit status) and goes on whatever the step did.
# ONLY=regex runs the steps whose names match (one device call is 10 minutes).

step() {  # step NAME COMMAND...
  local name=$1; shift
  [[ $name =~ ${ONLY:-.} ]] || return 0
  { echo "\$ $*"; echo; "$@" 2>&1; local status=$?; echo; echo "exit status: $status"; } > "$out/$name.txt"
  tail -n 25 "$out/$name.txt"
}

timed_step() {  # timed_step NAME LIMIT COMMAND...: as step, under `timeout` LIMIT seconds (SIGINT first, so a
  # difftest command keeps what finished), and its wall time
  local name=$1 limit=$2; shift 2
  if ! [[ $name =~ ${ONLY:-.} ]]; then echo "SKIPPED $name: not matched by ONLY=$ONLY"; return 0; fi
  local began=$SECONDS
  { echo "\$ $*"; echo; timeout --signal=INT --kill-after=20 "$limit" "$@" 2>&1; local status=$?; echo
    echo "exit status: $status$([ $status = 124 ] && echo " (killed after $limit s: raise the step's limit)")"
    echo "wall: $((SECONDS - began)) s"; } > "$out/$name.txt"
  tail -n 30 "$out/$name.txt"
}
