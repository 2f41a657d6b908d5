package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
)

// syncMemberships records each table's publication membership in the target; a table whose
// membership changed since it was recorded (it left the publication and came back, or was
// recreated) is marked for loading.
func (s *session) syncMemberships(ctx context.Context, names []cdc.TableName) error {
	tokens, err := cdc.Memberships(ctx, s.src, s.cfg.Publication, names)
	if err != nil {
		return err
	}
	for _, t := range s.tables {
		tok := tokens[cdc.TableName{Schema: t.Schema, Name: t.Name}]
		if tok == "" {
			return fmt.Errorf("table %s is not in publication %q after it was added: it was removed concurrently; restart", t, s.cfg.Publication)
		}
		changed, err := apply.SyncMembership(ctx, s.tgt, t, tok)
		if err != nil {
			return err
		}
		if changed {
			s.cfg.Logger.Warn("the table's publication membership changed since it was loaded (it left the publication and came back, was recreated, or the publication was altered): loading it again",
				"table", t.String(), "publication", s.cfg.Publication)
		}
	}
	s.names, s.memberships = names, tokens
	return nil
}

// checkMemberships ends the session (errMembershipChanged) when a table's publication membership
// differs from the one recorded at the session's start.
func (s *session) checkMemberships(ctx context.Context) {
	tokens, err := cdc.Memberships(ctx, s.src, s.cfg.Publication, s.names)
	if err != nil {
		return // a failing source ends the stream by itself
	}
	for n, tok := range s.memberships {
		if tokens[n] != tok {
			s.cancel(fmt.Errorf("%w for table %s (ALTER PUBLICATION … DROP/ADD TABLE, or the table was recreated): restarting the session to load it again",
				errMembershipChanged, n))
			return
		}
	}
}

// sampleWALEnd reads the source's pg_current_wal_lsn() now and then every second on the source
// connection, which is otherwise idle while streaming, until stop is called; every 5 s it also
// checks the tables' publication membership (checkMemberships). The returned function
// gives the last value read; errors leave it unchanged (the stream reports a failed source).
func (s *session) sampleWALEnd(ctx context.Context) (last func() pglogrepl.LSN, stop func()) {
	var lsn atomic.Uint64
	read := func(ctx context.Context) {
		var v string
		if err := s.src.QueryRow(ctx, "select pg_current_wal_lsn()::text").Scan(&v); err == nil {
			if l, err := pglogrepl.ParseLSN(v); err == nil {
				lsn.Store(uint64(l))
			}
		}
	}
	read(ctx)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				read(ctx)
				if n%5 == 0 {
					s.checkMemberships(ctx)
				}
			}
		}
	}()
	return func() pglogrepl.LSN { return pglogrepl.LSN(lsn.Load()) }, func() { cancel(); <-done }
}
