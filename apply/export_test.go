package apply

import (
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// StageByCOPY makes every merge of ap (and of the Appliers that share its CopyOnlyTables) into
// tab stage its rows by COPY, not inline (inline.go), until the test ends.
func StageByCOPY(t testing.TB, ap *Applier, tab changebatch.TableName) {
	db := targetDatabase(ap.conn)
	ap.copyOnly.add(db, tab)
	t.Cleanup(func() {
		ap.copyOnly.mu.Lock()
		defer ap.copyOnly.mu.Unlock()
		delete(ap.copyOnly.tables, copyOnlyKey(db, tab))
	})
}
