from sdq.cli import main

raise SystemExit(main())
