"""The built-in policies: FIFO compute, SiloD's greedy storage, multi-resource SJF and Gavel's max-min."""
