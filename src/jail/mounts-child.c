/* mounts-child.c - placeholder; filled in by its owner. */
