# Sourced by the scripts that start a store on a fixed port themselves.
# pick_port prints a port that nothing listens on and that lies outside the
# kernel's ephemeral range (net.ipv4.ip_local_port_range), so an outgoing
# connection of some other program can never be handed the same number
# while a run is using it. (`simple_write --mode pair` needs none of this:
# it lets the OS pick the port of the store it hosts.)
pick_port() {
  local lo=32768 hi=60999 range p tries
  if range=$(cat /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null); then
    read -r lo hi <<<"$range"
  fi
  for tries in $(seq 1 200); do
    if ((lo > 11000)); then
      p=$((10000 + RANDOM % (lo - 10000)))          # below the range
    else
      p=$((hi + 1 + RANDOM % (65535 - hi)))          # above it
    fi
    # Nothing listening there? (A refused connection means free.)
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  echo "pick_port: no free port outside the ephemeral range $lo-$hi" >&2
  return 1
}
