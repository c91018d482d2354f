from openstamp.cli import main

main()
