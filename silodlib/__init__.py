"""What both daemons use: dataset manifests, storage backends and dataset URIs, channels to the data manager,
log fields, and size and rate units. It imports neither `datamgr` nor `fuseclient`, which both import it."""
