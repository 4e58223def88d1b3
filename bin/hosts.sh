# Sourced by start-cluster and stop-cluster: hosts-file parsing and local-host detection.

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

# The ELASTANE_* settings to carry over ssh, so remote daemons use the same pid / log dirs.
remote_env() {
  local v out=""
  for v in ELASTANE_PID_DIR ELASTANE_LOG_DIR ELASTANE_IDENT_STRING ELASTANE_CONF_DIR ELASTANE_NM_OPTS; do
    [[ -n ${!v:-} ]] && out+="$v=$(printf '%q' "${!v}") "
  done
  printf '%s' "$out"
}
