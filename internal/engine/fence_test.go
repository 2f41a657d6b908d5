package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

// leaderSession returns a session of cfg that connected, described its tables and leads the slot
// at a new epoch (raised on a connection of the test: the leader lock is not what is tested),
// closed at cleanup, and its tables' names.
func leaderSession(t *testing.T, env *pgtest.Env, cfg Config) (*session, []changebatch.TableName) {
	t.Helper()
	ctx := context.Background()
	s := &session{sessionStart: sessionStart{cfg: cfg}, mon: cfg.monitor()}
	t.Cleanup(s.close)
	if err := s.connect(ctx); err != nil {
		t.Fatal(err)
	}
	_, names, err := s.describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, s.tgt); err != nil {
		t.Fatal(err)
	}
	if s.epoch, err = apply.Lead(ctx, pgtest.Connect(t, env.TargetURL), cfg.Slot, lease.Holder(), s.settings()); err != nil {
		t.Fatal(err)
	}
	return s, names
}

// A leader paused right before a change it makes only as the leader (Knobs.BeforeFenced: its
// session start's schema work, a bulk load's key deferral, its publication change), as a frozen
// process would be, holds off a new leader's epoch raise; once the raise passed it (ending what
// held it off, as a raise does past the lease) and the old leader thaws, the change fails, the
// session ends as fenced (lost leadership), and the target table and the publication are as
// before the takeover. A publication change made while a raise waits, not yet past its lease, is
// rolled back before it commits, and the raise passes.
func TestThawedLeaderChangesNothingAfterATakeover(t *testing.T) {
	t.Parallel()
	cases := []struct {
		pause string
		// before prepares the source (and the target, with prepare) before the old leader's
		// session; work is what the old leader's session does; unchanged says what the test
		// finds in the databases afterwards, "" when nothing changed.
		before    func(t *testing.T, env *pgtest.Env, prepare func())
		work      func(ctx context.Context, s *session, names []changebatch.TableName) error
		unchanged func(t *testing.T, env *pgtest.Env) string
		// waits leaves the raise waiting: the old leader thaws before the raise ended it.
		waits bool
	}{{
		// A column the source table gained is not added to the target table.
		pause: "schema",
		before: func(t *testing.T, env *pgtest.Env, prepare func()) {
			prepare()
			pgtest.Exec(t, env.Source, `alter table t add column w int`)
		},
		work: func(ctx context.Context, s *session, names []changebatch.TableName) error {
			return s.prepare(ctx, names)
		},
		unchanged: func(t *testing.T, env *pgtest.Env) string {
			if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_attribute where attrelid = 'public.t'::regclass and attname = 'w'`); n != 0 {
				return "the target table got column w"
			}
			return ""
		},
	}, {
		// The initial load of a table never loaded does not drop its key.
		pause: "key public.t",
		work: func(ctx context.Context, s *session, names []changebatch.TableName) error {
			if err := s.prepare(ctx, names); err != nil {
				return err
			}
			_, err := s.prepareSlot(ctx)
			return err
		},
		unchanged: func(t *testing.T, env *pgtest.Env) string {
			if n := pgtest.Scalar[int64](t, env.Target, `select count(*) from pg_constraint where conrelid = 'public.t'::regclass and contype = 'p'`); n != 1 {
				return "the target table lost its primary key"
			}
			return ""
		},
	}, {
		// The table is not added to the publication.
		pause: "publication",
		work: func(ctx context.Context, s *session, names []changebatch.TableName) error {
			return s.prepare(ctx, names)
		},
		unchanged: unpublished,
	}, {
		// Paused after adding it, before committing, the old leader finds the raise waiting.
		pause: "publication commit",
		work: func(ctx context.Context, s *session, names []changebatch.TableName) error {
			return s.prepare(ctx, names)
		},
		unchanged: unpublished,
		waits:     true,
	}}
	for _, c := range cases {
		t.Run(c.pause, func(t *testing.T) {
			t.Parallel() // each case has its own databases and slot
			env := pgtest.New(t)
			pgtest.Exec(t, env.Source, `create table t (id int primary key, v text)`, `insert into t select g, 'v' || g from generate_series(1, 100) g`)
			cfg := internalConfig(t, env)
			cfg.Tables = []string{"public.t"}
			if c.before != nil {
				c.before(t, env, func() {
					first, names := leaderSession(t, env, cfg)
					if err := first.prepare(context.Background(), names); err != nil {
						t.Fatal(err)
					}
					first.close()
				})
			}
			paused, thaw := make(chan struct{}), make(chan struct{})
			var once sync.Once
			cfg.Knobs.BeforeFenced = func(change string) {
				if change == c.pause {
					once.Do(func() { close(paused) })
					<-thaw
				}
			}
			old, names := leaderSession(t, env, cfg)
			ctx := context.Background()
			done := make(chan error, 1)
			go func() { done <- c.work(ctx, old, names) }()
			select {
			case <-paused:
			case err := <-done:
				t.Fatalf("the old leader's work ended before the change %q: %v", c.pause, err)
			case <-time.After(60 * time.Second):
				t.Fatalf("the old leader did not reach the change %q", c.pause)
			}
			thawed := false
			defer func() {
				if !thawed {
					close(thaw)
				}
			}()
			// The new leader's raise waits for the paused leader; past its lease it ends the
			// sessions that hold it off (raiseEpoch), done here at once unless c.waits.
			lock, watch := pgtest.Connect(t, env.TargetURL), pgtest.Connect(t, env.TargetURL)
			raised := make(chan int64, 1)
			go func() {
				e, err := apply.Lead(ctx, lock, cfg.Slot, "new", old.settings())
				if err != nil {
					t.Error(err)
				}
				raised <- e
			}()
			epoch := int64(0)
			pgtest.Eventually(t, 30*time.Second, "the new leader's raise waits for the paused old leader", func() (bool, string) {
				select {
				case epoch = <-raised:
					t.Errorf("the new leader raised the epoch to %d at once, while the old leader was about to make the change %q", epoch, c.pause)
					return true, ""
				default:
				}
				b := pgtest.Scalar[[]int32](t, watch, `select pg_blocking_pids($1)`, lock.PgConn().PID())
				return len(b) > 0, fmt.Sprintf("the raise waits for %v", b)
			})
			if epoch == 0 && !c.waits {
				endBlockers(t, watch, lock)
				epoch = <-raised
			}
			thawed = true
			close(thaw)
			var err error
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the thawed leader's work did not end")
			}
			if epoch == 0 {
				epoch = <-raised // the thawed leader let it pass
			}
			if epoch != old.epoch+1 {
				t.Errorf("the new leader's epoch is %d, want %d", epoch, old.epoch+1)
			}
			if err == nil {
				t.Error("the thawed leader's work succeeded after the takeover")
			} else if err = old.explainByTakeover(ctx, err); !lostLeadership(err) {
				t.Errorf("the thawed leader's session ended with %v; want it fenced (lost leadership)", err)
			} else {
				t.Logf("the thawed leader's session ended with: %v", err)
			}
			if what := c.unchanged(t, env); what != "" {
				t.Errorf("after the takeover %s: the thawed leader changed it (its error: %v)", what, err)
			}
		})
	}
}

// endBlockers ends the target sessions that lock's session waits for, as raiseEpoch does past
// the lease, over watch.
func endBlockers(t *testing.T, watch, lock *pgx.Conn) {
	t.Helper()
	pgtest.Scalar[[]int32](t, watch, `select coalesce(array_agg(b), '{}') from unnest(pg_blocking_pids($1)) b where pg_terminate_backend(b)`, lock.PgConn().PID())
}

// unpublished returns "" when the test's publication publishes no table, else what it found.
func unpublished(t *testing.T, env *pgtest.Env) string {
	if n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_publication_tables where pubname = $1`, env.Name); n != 0 {
		return "the table was published"
	}
	return ""
}

// A publication change whose commit does not follow within a third of the lease (the process
// stalled between the change and its commit, when a raise that began meanwhile may pass the
// leader's hold of the epoch a lease after it began) is ended by the source and changes nothing;
// the session is retried.
func TestPublicationChangeCommitsWithinItsBound(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table t (id int primary key)`)
	cfg := internalConfig(t, env)
	cfg.Tables = []string{"public.t"}
	paused, thaw := make(chan struct{}), make(chan struct{})
	cfg.Knobs.BeforeFenced = func(change string) {
		if change == "publication commit" {
			close(paused)
			<-thaw
		}
	}
	s, names := leaderSession(t, env, cfg)
	done := make(chan error, 1)
	go func() { done <- s.prepare(context.Background(), names) }()
	select {
	case <-paused:
	case err := <-done:
		t.Fatalf("the session ended before committing its publication change: %v", err)
	}
	pid := s.src.PgConn().PID()
	pgtest.Eventually(t, 2*lease.Term, "the source ends the transaction that waits for its commit", func() (bool, string) {
		n := pgtest.Scalar[int64](t, env.Source, `select count(*) from pg_stat_activity where pid = $1`, pid)
		return n == 0, fmt.Sprintf("%d sessions of pid %d", n, pid)
	})
	close(thaw)
	err := <-done
	if err == nil || !retryable(err) {
		t.Errorf("the session ended with %v; want an error that is retried", err)
	} else {
		t.Logf("the session ended with: %v", err)
	}
	if what := unpublished(t, env); what != "" {
		t.Errorf("%s by a commit that came after its bound", what)
	}
}

// internalConfig is testConfig (helpers_test.go) for the tests inside the package, which reach
// the session itself.
func internalConfig(t *testing.T, env *pgtest.Env) Config {
	return Config{
		Source: env.SourceURL, Target: env.TargetURL, Slot: env.Name, Publication: env.Name,
		BackfillWorkers: 2, ChunkRows: 1000, OnGap: OnGapBackfill,
		Logger: slog.New(slog.NewTextHandler(pgtest.LogWriter(t), &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}
