# Sourced by every script for the same behaviour at the command line:
# --help prints the script's header comment and exits 0 before anything
# else happens; an unknown option is refused with exit 2, as the programs'
# argument parser (clap) does.
#
#   source "$ROOT/scripts/lib/cli.sh"
#   -h|--help) usage; exit 0 ;;
#   *) bad_option "$1" ;;

# The header comment of the sourcing script (every line from the second up
# to the first that is not a comment), without the '# '.
usage() {
  sed -n '2,/^[^#]/{/^#/!d;s/^# \{0,1\}//;s/^#$//;p}' "$0"
}

# Refuses option $1 of the sourcing script: exit 2.
bad_option() {
  echo "$(basename "$0"): unknown option '$1' (try --help)" >&2
  exit 2
}

# Refuses option $1 that needs a value when $2 (the number of arguments
# left, the option included) says there is none: exit 2.
need_value() {
  (($2 >= 2)) || { echo "$(basename "$0"): $1 needs a value (try --help)" >&2; exit 2; }
}

# The options every GPU-machine script takes: where its binaries come from
# and where its results go. Sets BUNDLE, BIN, NIXL_LIB or OUT from option
# $1 and its value $3 ($2: the arguments left, the option included):
#   --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
gpu_option() {
  need_value "$1" "$2"
  case "$1" in
    --bundle) BUNDLE=$3 ;;
    --bin) BIN=$3 ;;
    --nixl-lib) NIXL_LIB=$3 ;;
    --out) OUT=$3 ;;
  esac
}
