package apply

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// StageByCOPY makes every merge into tab over conn's target database stage its rows by COPY, not
// inline (inline.go), until the test ends.
func StageByCOPY(t testing.TB, conn *pgx.Conn, tab changebatch.TableName) {
	key := copyOnlyKey(targetDatabase(conn), changebatch.Table{TableName: tab})
	copyOnly.Store(key, true)
	t.Cleanup(func() { copyOnly.Delete(key) })
}
