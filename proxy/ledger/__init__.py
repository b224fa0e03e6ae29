"""What happened: a request's record as the attempt loop fills it (`exchange`), the ledger's tables
(`models`), the writer thread that saves them off the request's path (`recorder`, with its crash spool
`spool` and its writes `services`), and what operators scrape and trace (`metrics`, `tracing`)."""
