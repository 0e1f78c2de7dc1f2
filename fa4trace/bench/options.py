"""What `fa4trace bench` can be asked for, as plain constants: the CLI builds its options from
these without importing the benchmark (numpy, pyarrow, torch at run time)."""

# Where the traced variants are timed: "long" = the sk 131072, sq 1 shapes; "all" = every shape.
TRACE_AT = ("long", "all")
# The traced variants (kernel name suffixes), each timed next to the untraced "+ref" twin:
# every warp records; only the lead warps store; every warp with the stall events; only the
# first CTA stores (the recorder's instructions without the record traffic).
TRACED_VARIANTS = ("trace", "tracelead", "tracestalls", "trace1")
DEFAULT_TRACED = ("trace", "tracelead", "tracestalls")
