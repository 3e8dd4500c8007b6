# Sourced by every script under scripts/, after it has cd'd to the repository's root: the
# one place that reads CARGO_TARGET_DIR. Sets
#   target  the workspace's target dir, always absolute (the scripts run tools from other
#           directories: pytest from clients/python, cargo from guest-examples);
#   guests  where a cargo build run in guest-examples/ puts its output (that workspace
#           has a target dir of its own unless CARGO_TARGET_DIR is set);
# and, where CARGO_TARGET_DIR was set to a relative path, exports it made absolute
# (against the root, where the scripts run cargo), so that a cargo started from
# guest-examples/ builds where $guests says rather than in guest-examples/<relative>.
# Unset stays unset: each workspace keeps its own target/, as for a newcomer.
# scripts/check-paths tests this under all three settings.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    case $CARGO_TARGET_DIR in
    /*) ;;
    *) CARGO_TARGET_DIR=$PWD/$CARGO_TARGET_DIR ;;
    esac
    export CARGO_TARGET_DIR
    target=$CARGO_TARGET_DIR
    guests=$CARGO_TARGET_DIR
else
    target=$PWD/target
    guests=$PWD/guest-examples/target
fi
