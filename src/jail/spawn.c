/* spawn.c - placeholder; filled in by its owner. */
