from initadvisor.cli import main

main()
