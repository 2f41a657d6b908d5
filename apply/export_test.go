package apply

import (
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// StageByCOPY makes every merge into tab stage its rows by COPY, not inline (inline.go), until
// the test ends.
func StageByCOPY(t testing.TB, tab changebatch.TableName) {
	copyOnly.Store(tab.String(), true)
	t.Cleanup(func() { copyOnly.Delete(tab.String()) })
}
