package overlap

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// The errors keep their dispositions through wrapping: a table followed elsewhere backs off with
// reason "overlap", a stopped follower restarts the session at once.
func TestDispositions(t *testing.T) {
	followed := fmt.Errorf("record coverage: %w", FollowedElsewhereError{})
	if got := disposition.Decide(followed); got != disposition.BackOff {
		t.Errorf("Decide(followed elsewhere) = %v, want BackOff", got)
	}
	if got := disposition.ReasonOf(followed); got != "overlap" {
		t.Errorf("ReasonOf(followed elsewhere) = %q, want overlap", got)
	}
	var e FollowedElsewhereError
	if !errors.As(followed, &e) {
		t.Errorf("errors.As does not find FollowedElsewhereError in %v", followed)
	}
	stopped := fmt.Errorf("%w: public.t", ErrFollowerStopped)
	if !errors.Is(stopped, ErrFollowerStopped) || disposition.Decide(stopped) != disposition.Restart {
		t.Errorf("a stopped follower: errors.Is %v, Decide %v, want true and Restart", errors.Is(stopped, ErrFollowerStopped), disposition.Decide(stopped))
	}
}

// The error names each table, its follower and the follower's last leader, then the fix.
func TestFollowedElsewhereErrorMessage(t *testing.T) {
	a, b := changebatch.TableName{Schema: "public", Name: "a"}, changebatch.TableName{Schema: "public", Name: "b"}
	err := FollowedElsewhereError{
		Followers: []coverage.Follower{{Table: a, Slot: "one"}, {Table: b, Slot: "two"}},
		Leaders:   map[string]apply.LeaderState{"one": {Leader: apply.Leader{Holder: "h pid 1", AcquiredAt: "2024-01-01 00:00:00+00"}}},
	}
	want := `public.a is followed by a running daemon of slot "one" (last leader h pid 1, since 2024-01-01 00:00:00+00); ` +
		`public.b is followed by a running daemon of slot "two" (last leader , since ): ` +
		"one table is followed by one daemon (two would reload it from each other); take the table out of one daemon's selection (--tables, or ALTER PUBLICATION … DROP TABLE for a daemon without --tables) or stop the other daemon; this daemon leaves the table to it until then, and takes it over once that daemon stopped"
	if got := err.Error(); got != want {
		t.Errorf("Error():\n got %q\nwant %q", got, want)
	}
}

// A selection without the tables waited for keeps the others in order, and leaves the selection
// it was made from as it was.
func TestSelectionWithout(t *testing.T) {
	n := func(name string) changebatch.TableName { return changebatch.TableName{Schema: "public", Name: name} }
	sel := Selection{DescribedAt: 7, Streamed: []changebatch.TableName{n("a"), n("b"), n("c")}, SnapshotOnly: []changebatch.TableName{n("k"), n("l")}}
	waiting := []coverage.Follower{{Table: n("b"), Slot: "other"}, {Table: n("l"), Slot: "other"}}
	got := sel.without(waiting)
	if got.DescribedAt != 7 || !slices.Equal(got.Streamed, []changebatch.TableName{n("a"), n("c")}) || !slices.Equal(got.SnapshotOnly, []changebatch.TableName{n("k")}) {
		t.Errorf("without: %+v", got)
	}
	if len(sel.Streamed) != 3 || sel.Streamed[1] != n("b") || len(sel.SnapshotOnly) != 2 {
		t.Errorf("without changed the selection it was made from: %+v", sel)
	}
	if all := sel.all(); !slices.Equal(all, []changebatch.TableName{n("a"), n("b"), n("c"), n("k"), n("l")}) {
		t.Errorf("all: %v", all)
	}
	if !Followed(waiting, n("l")) || Followed(waiting, n("a")) {
		t.Errorf("Followed: l %v, a %v; want true, false", Followed(waiting, n("l")), Followed(waiting, n("a")))
	}
}
