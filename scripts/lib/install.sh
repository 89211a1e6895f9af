# shellcheck shell=bash
# Installing Debian packages for coldbrew's scripts: who may, whether to, and the line to run.
#
# Sourced by scripts/ensure-services (PostgreSQL, RabbitMQ) and .ci/run (make,
# python3-venv), so the two never disagree on when apt-get runs. Only defines
# functions and the ROOT_CMD / CAN_ROOT variables; runs nothing by itself.
#
# Environment:
#   COLDBREW_INSTALL_SERVICES  yes: install without asking; no: never install;
#                              ask (the default): ask on a terminal, else only advise.
#   CI                         true (as CI services set it) counts as yes when
#                              COLDBREW_INSTALL_SERVICES is not set.
#   COLDBREW_ENSURE_DRY_RUN    1: print what would be installed instead of running apt-get (tests).

# ROOT_CMD: how to run a command as root (empty as root); CAN_ROOT: whether we can at all.
ROOT_CMD=()
CAN_ROOT=false
if [[ $(id -u) -eq 0 ]]; then
    CAN_ROOT=true
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    CAN_ROOT=true
    ROOT_CMD=(sudo -n)
fi

# can_install: root (or password-less sudo) and apt-get are both here.
can_install() { $CAN_ROOT && command -v apt-get >/dev/null 2>&1; }

# install_wish: the normalised COLDBREW_INSTALL_SERVICES (yes, no or ask), CI=true
# counting as yes when it is unset. Fails (status 2) naming the variable on a bad value.
install_wish() {
    local value=${COLDBREW_INSTALL_SERVICES:-}
    case "${value,,}" in
        yes | y | true | 1) printf 'yes' ;;
        no | n | false | 0) printf 'no' ;;
        ask) printf 'ask' ;;
        "")
            case "${CI:-}" in
                true | TRUE | True | 1 | yes) printf 'yes' ;;
                *) printf 'ask' ;;
            esac ;;
        *)
            printf '%s: COLDBREW_INSTALL_SERVICES must be yes, no or ask; got %q\n' "${0##*/}" "$value" >&2
            return 2 ;;
    esac
}

# install_choice WISH ON_TTY CAN: what to do about missing packages.
#   install  go ahead;  ask  ask the user first;  advise  only print the line to run.
# WISH from install_wish; ON_TTY and CAN are true or false.
install_choice() {
    local wish=$1 on_tty=$2 can=$3
    if [[ $wish == no || $can != true ]]; then
        printf 'advise'
    elif [[ $wish == yes ]]; then
        printf 'install'
    elif [[ $on_tty == true ]]; then
        printf 'ask'
    else
        printf 'advise'
    fi
}

# install_line PACKAGE...: the exact command a person should run to install them.
install_line() {
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo "
    if command -v apt-get >/dev/null 2>&1; then
        printf '%sapt-get update && %sapt-get install -y %s' "$sudo" "$sudo" "$*"
    else
        printf 'install %s with this system'"'"'s package manager (no apt-get here)' "$*"
    fi
}

# apt_install PACKAGE...: install them (quietly, no recommends) as root; honours the dry run.
apt_install() {
    if [[ ${COLDBREW_ENSURE_DRY_RUN:-} == 1 ]]; then
        printf 'dry run (COLDBREW_ENSURE_DRY_RUN=1): would run: %s\n' "$(install_line "$@")"
        return 0
    fi
    DEBIAN_FRONTEND=noninteractive "${ROOT_CMD[@]}" apt-get update -qq </dev/null
    DEBIAN_FRONTEND=noninteractive "${ROOT_CMD[@]}" apt-get install -y -qq --no-install-recommends "$@" \
        </dev/null >/dev/null
}

# stop_packaged_prometheus: Debian's prometheus package starts its service on :9090 where an
# init system runs; .ci/run wants only the binaries (promtool; tests start their own on a free
# port), so it stops and disables that one service again. Touches nothing else; never fails.
stop_packaged_prometheus() {
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
        "${ROOT_CMD[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
    elif command -v invoke-rc.d >/dev/null 2>&1 && [[ -x /etc/init.d/prometheus ]]; then
        "${ROOT_CMD[@]}" invoke-rc.d prometheus stop >/dev/null 2>&1 || true
    fi
    return 0
}
