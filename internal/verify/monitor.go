package verify

// Monitor receives what verify runs count, for metrics. Methods are called from several
// goroutines and must not block. Table names are as changebatch.TableName.String prints them.
type Monitor interface {
	// DiscrepanciesFound counts n discrepancies of kind ("missing", "extra", "different") a
	// verify run found in table; DiscrepanciesRepaired n it repaired; DiscrepanciesSuppressed n
	// it found again under a known id (a replayed or repeated run), which recorded nothing new.
	DiscrepanciesFound(table, kind string, n int64)
	DiscrepanciesRepaired(table string, n int64)
	DiscrepanciesSuppressed(table string, n int64)
}

// nopMonitor counts nothing: the Monitor of a Config without one.
type nopMonitor struct{}

func (nopMonitor) DiscrepanciesFound(string, string, int64) {}
func (nopMonitor) DiscrepanciesRepaired(string, int64)      {}
func (nopMonitor) DiscrepanciesSuppressed(string, int64)    {}
