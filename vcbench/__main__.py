from vcbench.cli import main

main()
