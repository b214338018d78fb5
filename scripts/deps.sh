# Sourced by the scripts in this folder: installs missing system packages with apt-get.
need_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo not found: install a Rust toolchain (https://rustup.rs) and re-run" >&2
        exit 1
    fi
}

# need_apt_packages PKG...: installs the packages that are not installed yet.
need_apt_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "installing: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
