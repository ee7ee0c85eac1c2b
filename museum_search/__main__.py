from museum_search.cli import main

raise SystemExit(main())
