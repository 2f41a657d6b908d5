package pgsession

import (
	"errors"
	"os"
	"testing"
	"time"
)

// Each statement under Bound gets the deadline on its own (several short ones outlast it
// together), one that outlasts it fails and is recorded as a *TimeoutError naming the server, and
// Unbound lifts it.
func TestDeadlineBoundsEachStatement(t *testing.T) {
	url := os.Getenv("PGCONVERGE_TEST_SOURCE")
	if url == "" {
		if os.Getenv("PGCONVERGE_REQUIRE_INTEGRATION") == "1" {
			t.Fatal("PGCONVERGE_TEST_SOURCE is not set: run the tests with scripts/test.sh")
		}
		t.Skip("integration test: PGCONVERGE_TEST_SOURCE unset")
	}
	d := NewDeadline(time.Second)
	ctx := d.Bound(t.Context())
	conn, err := Connect(ctx, url, "source")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	for range 3 {
		if _, err := conn.Exec(ctx, `select pg_sleep(0.4)`); err != nil {
			t.Fatalf("a statement within the deadline: %v", err)
		}
	}
	if _, err := conn.Exec(Unbound(ctx), `select pg_sleep(1.2)`); err != nil {
		t.Fatalf("an unbound statement: %v", err)
	}
	if d.Expired() != nil {
		t.Fatalf("expired before any statement outlasted the deadline: %v", d.Expired())
	}
	if _, err := conn.Exec(ctx, `select pg_sleep(5)`); err == nil {
		t.Fatal("a statement past the deadline succeeded")
	}
	var te *TimeoutError
	if !errors.As(d.Expired(), &te) || te.Role != "source" || te.Timeout != time.Second {
		t.Fatalf("Expired = %v, want the source's TimeoutError of 1s", d.Expired())
	}
}
