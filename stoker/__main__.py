from stoker.cli.main import main

main()
