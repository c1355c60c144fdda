"""What gets tuned: a SearchTask (a program, a target, its hardware facts), the registered workloads, and the
in-process path from a loop state to a built, runnable program."""
