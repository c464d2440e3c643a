from gpucache.pairing.training.fit import main

main()
