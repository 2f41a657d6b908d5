package apply

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/advisory"
)

// HoldEpoch makes what conn does from now on until release runs the work of slot's leader at
// epoch, in any number of transactions and statements (a session start's DDL, a bulk load's key
// deferral, each committing on its own): it takes slot's epoch lock, shared, in conn's session,
// then fails with a *FencedError (releasing the lock) unless epoch is still slot's epoch. Lead
// takes the lock exclusively before it raises the epoch, so a raise waits for every holder, and
// after a raise the check fails. The check is a statement of its own, after the lock was granted,
// so it sees a raise that committed while it waited. A new leader ends the sessions that hold off
// its raise past its lease (pg_terminate_backend): that ends conn, so nothing conn sends after a
// raise runs. release, which a broken connection makes a no-op, takes no context: it runs also
// when ctx ended.
func HoldEpoch(ctx context.Context, conn *pgx.Conn, slot string, epoch int64) (release func(), err error) {
	var ignored string
	if err := conn.QueryRow(ctx, `select `+advisory.Epoch("$1").LockShared()+`::text`, slot).Scan(&ignored); err != nil {
		return nil, fmt.Errorf("hold the leader epoch of slot %q on the target: %w", slot, err)
	}
	release = func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `select `+advisory.Epoch("$1").UnlockShared()+`::text`, slot)
	}
	if err := checkLeader(conn.QueryRow(ctx, `select epoch, holder from pgconverge.leaders where slot = $1`, slot), slot, epoch); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// CheckUnchallenged fails unless conn's session, which holds slot's epoch (HoldEpoch), is alive
// and no new leader's raise waits for it: with a *FencedError when one waits (its Current is 0:
// the raise has not committed yet), with the connection's error when the session ended (a new
// leader may have ended it). After a nil error, a raise that passes the hold began to wait for
// it after the check, so it passes only once conn releases it or the raise's lease ran out.
func CheckUnchallenged(ctx context.Context, conn *pgx.Conn, slot string, epoch int64) error {
	var waiting bool
	err := conn.QueryRow(ctx, `select `+advisory.Epoch("$1").Awaited(), slot).Scan(&waiting)
	if err != nil {
		return fmt.Errorf("check the hold of slot %q's leader epoch on the target: %w", slot, err)
	}
	if waiting {
		return &FencedError{Slot: slot, Epoch: epoch, Holder: "a daemon taking over (its epoch raise waits for this daemon)"}
	}
	return nil
}
