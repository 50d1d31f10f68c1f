from equeue.cli import main

main()
