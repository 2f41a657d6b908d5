package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	. "github.com/pgconverge/pgconverge/internal/engine"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

func testConfig(t *testing.T, env *pgtest.Env) Config {
	return Config{
		Source: env.SourceURL, Target: env.TargetURL, Slot: env.Name, Publication: env.Name,
		BackfillWorkers: 2, ChunkRows: 1000, OnGap: OnGapBackfill, StreamInProgress: true,
		Logger: slog.New(slog.NewTextHandler(pgtest.LogWriter(t), &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

// quickOverlap shortens the timings of a hand-over between daemons of two slots that share a table
// (Knobs.OverlapGrace 2 s, OverlapPoll 500 ms; production: overlap.Grace, overlap.Poll), for tests
// whose daemons hand a table over after one stops and that assert no production timing: the
// grace covers a daemon that lost its target connections and takes its running lock again
// (TestDaemonsCutFromTheTargetKeepTheirTables keeps the production timings).
func quickOverlap(cfgs ...*Config) {
	for _, c := range cfgs {
		c.Knobs.OverlapGrace, c.Knobs.OverlapPoll = 2*time.Second, 500*time.Millisecond
	}
}

// startDaemon starts the daemon with cfg; it is stopped (as by SIGTERM) at cleanup at the latest.
func startDaemon(t *testing.T, cfg Config) *pgtest.Running {
	t.Helper()
	return pgtest.Start(t, func(ctx context.Context) error { return Run(ctx, cfg) })
}

// requireRefusal runs the daemon with cfg (at most 30 s) and requires it to stop with an error
// that mentions every string of want.
func requireRefusal(t *testing.T, cfg Config, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, cfg)
	if err == nil {
		t.Fatalf("run succeeded, want an error mentioning %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}
