"""The `silod` command line, one program for every component: `main` (the entry point, the data manager's
`serve` and the demo), `commands` (the data manager's client commands), `fuse_client` (`mount`, `node`,
`umount`), `sim` and `sim_sweep` (the simulator); `args`, `config` and `tables` are what they share."""
