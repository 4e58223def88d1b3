# Sourced by start-cluster and stop-cluster: hosts-file parsing, local-host detection, and running
# one command on every host in parallel (like Hadoop's workers.sh).

# Print the hosts of a hosts file: one per line, `#` comments and blank lines skipped, each once.
read_hosts() {
  sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$1" | awk 'NF && !seen[$0]++'
}

# True for names of this machine, which get their NM without ssh.
is_local_host() {
  case $1 in
    localhost|127.0.0.1|::1|"$(hostname)"|"$(hostname -f 2>/dev/null || hostname)") return 0 ;;
  esac
  return 1
}

# The ELASTANE_* settings to carry over ssh, so remote daemons use the same pid / log / conf dirs
# and interpreter (ELASTANE_PYTHON: an ssh session's PATH is sshd's, not the caller's),
# and the host's name as the hosts file gives it (ELASTANE_HOSTNAME: its nm-<name>.toml overrides).
remote_env() {
  local host=$1 v out=""
  for v in ELASTANE_PID_DIR ELASTANE_LOG_DIR ELASTANE_IDENT_STRING ELASTANE_CONF_DIR ELASTANE_NM_OPTS \
           ELASTANE_RM_OPTS ELASTANE_RM_ID ELASTANE_RM_PORT ELASTANE_START_TIMEOUT ELASTANE_STOP_TIMEOUT ELASTANE_PYTHON; do
    [[ -n ${!v:-} ]] && out+="$v=$(printf '%q' "${!v}") "
  done
  out+="ELASTANE_HOSTNAME=$(printf '%q' "$host") "
  printf '%s' "$out"
}

# on_hosts HOSTSFILE SCRIPT [ARGS...]: run bin/SCRIPT on every host of HOSTSFILE at once -- this
# machine's directly, the others over ssh (with $ELASTANE_SSH_OPTS, stdin closed so ssh cannot eat
# the hosts list), each output line prefixed with its host. Returns non-zero naming every host that
# failed.
on_hosts() {
  local file=$1 script=$2
  shift 2
  local -a ssh_opts=()
  read -r -a ssh_opts <<<"${ELASTANE_SSH_OPTS:-}"
  local tmp host local_done=0 failed=""
  tmp=$(mktemp -d)
  local remote_cmd
  remote_cmd=$(printf '%q' "$BIN/$script")
  (($#)) && remote_cmd+=" $(printf '%q ' "$@")"
  local -a hosts=()
  mapfile -t hosts < <(read_hosts "$file")
  for host in "${hosts[@]}"; do
    if is_local_host "$host"; then
      # One NM per host: a second name for this machine (localhost, 127.0.0.1, its hostname) is skipped.
      if ((local_done)); then echo "$host: is this machine, which is already done"; continue; fi
      local_done=1
      ( set +e; ELASTANE_HOSTNAME=${ELASTANE_HOSTNAME:-$host} "$BIN/$script" "$@" </dev/null 2>&1 \
          | sed -u "s/^/$host: /"; echo "${PIPESTATUS[0]}" >"$tmp/$host" ) &
    else
      ( set +e; ssh -o BatchMode=yes "${ssh_opts[@]}" "$host" "$(remote_env "$host") $remote_cmd" </dev/null 2>&1 \
          | sed -u "s/^/$host: /"; echo "${PIPESTATUS[0]}" >"$tmp/$host" ) &
    fi
  done
  wait
  for host in "${hosts[@]}"; do
    [[ -f $tmp/$host ]] || continue
    [[ $(<"$tmp/$host") == 0 ]] || failed+=" $host"
  done
  rm -rf "$tmp"
  if [[ -n $failed ]]; then
    echo "$(basename "$0"): $script failed on:$failed" >&2
    return 1
  fi
  return 0
}

# on_rms "ID HOST PORT" LINES SCRIPT [ARGS...]: run bin/SCRIPT for each ResourceManager of an HA
# cluster (one "ID HOST PORT" line each, from `python -m elastane_cli.ha_rm_hosts`) on its host with
# ELASTANE_RM_ID=ID (and ELASTANE_RM_PORT=PORT, its listed port), all at once -- this machine's directly (two RMs of one host both run), the
# others over ssh as on_hosts does -- each output line prefixed with the id. Returns non-zero
# naming every RM that failed.
on_rms() {
  local lines=$1 script=$2
  shift 2
  local -a ssh_opts=()
  read -r -a ssh_opts <<<"${ELASTANE_SSH_OPTS:-}"
  local tmp rm_id host port failed=""
  tmp=$(mktemp -d)
  local remote_cmd
  remote_cmd=$(printf '%q' "$BIN/$script")
  (($#)) && remote_cmd+=" $(printf '%q ' "$@")"
  local -a ids=()
  while read -r rm_id host port; do
    [[ -n $rm_id ]] || continue
    ids+=("$rm_id")
    if is_local_host "$host"; then
      ( set +e; ELASTANE_RM_ID=$rm_id ELASTANE_RM_PORT=$port "$BIN/$script" "$@" </dev/null 2>&1 \
          | sed -u "s/^/$rm_id ($host): /"; echo "${PIPESTATUS[0]}" >"$tmp/$rm_id" ) &
    else
      ( set +e; ssh -o BatchMode=yes "${ssh_opts[@]}" "$host" \
          "$(ELASTANE_RM_ID=$rm_id ELASTANE_RM_PORT=$port remote_env "$host") $remote_cmd" </dev/null 2>&1 \
          | sed -u "s/^/$rm_id ($host): /"; echo "${PIPESTATUS[0]}" >"$tmp/$rm_id" ) &
    fi
  done <<<"$lines"
  wait
  for rm_id in "${ids[@]}"; do
    [[ -f $tmp/$rm_id ]] || continue
    [[ $(<"$tmp/$rm_id") == 0 ]] || failed+=" $rm_id"
  done
  rm -rf "$tmp"
  if [[ -n $failed ]]; then
    echo "$(basename "$0"): $script failed for the ResourceManager(s):$failed" >&2
    return 1
  fi
  return 0
}
