package schedule

import (
	"context"
	"log/slog"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// Without a schedule, or with one but no table, Run starts nothing and returns nil when ctx ends
// (Verifies without a schedule at once): no job is built, no hook runs.
func TestRunWithoutScheduleDoesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	every, err := Parse("@every 1s")
	if err != nil {
		t.Fatal(err)
	}
	b := Backfills{
		Schedule: nil, SnapshotSchedule: every, // a snapshot schedule without snapshot-only tables
		Tables: []changebatch.Table{{TableName: changebatch.TableName{Schema: "public", Name: "t"}}},
		Logger: slog.New(slog.DiscardHandler),
		NewJob: func([]changebatch.Table, string, string) backfillrun.Job {
			t.Error("a backfill job was built")
			return backfillrun.Job{}
		},
		OnEvent: func(ev Event) { t.Errorf("event %q", ev) },
	}
	if err := b.Run(ctx); err != nil {
		t.Errorf("Backfills.Run = %v", err)
	}
	v := Verifies{Logger: b.Logger, Verified: func(verify.Report, error) { t.Error("a verify ran") }}
	if err := v.Run(t.Context()); err != nil {
		t.Errorf("Verifies.Run = %v", err)
	}
}
