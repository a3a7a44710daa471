from simpar.cli import main

raise SystemExit(main())
