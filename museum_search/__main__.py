import sys

try:
    from museum_search.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line itself loads: nothing has begun
    print("museum-search: cancelled; nothing was changed", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
