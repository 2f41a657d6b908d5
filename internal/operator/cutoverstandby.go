package operator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// errStandbyNeedsPrimary is the refusal of a cutover from a standby source without --primary.
var errStandbyNeedsPrimary = errors.New("the source is a standby: cutover needs --primary, the URL of its primary, whose current WAL position is where the cutover cuts (the application writes there, and the standby may not have replayed everything yet) and where the publication is dropped")

// writer returns the connection on which the cutover reads the position to cut at and drops the
// publication: src itself on a primary; on a standby in recovery a new connection to primaryURL
// (closed by the returned func), or errStandbyNeedsPrimary without one.
func writer(ctx context.Context, src *pgx.Conn, primaryURL string) (*pgx.Conn, func(), error) {
	standby, err := cdc.InRecovery(ctx, src)
	if err != nil {
		return nil, nil, err
	}
	if !standby {
		return src, func() {}, nil
	}
	if primaryURL == "" {
		return nil, nil, errStandbyNeedsPrimary
	}
	primary, err := pgsession.Connect(ctx, primaryURL, "primary")
	if err != nil {
		return nil, nil, err
	}
	if err := cdc.CheckPrimary(ctx, primary, src); err != nil {
		primary.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return primary, func() { primary.Close(context.WithoutCancel(ctx)) }, nil
}

// cutPosition returns the position the cutover streams up to: the current WAL position of the
// source, or of its primary when the source is a standby (writer), which the standby's slot
// reaches once it has replayed that far.
func cutPosition(ctx context.Context, src *pgx.Conn, primaryURL string) (pglogrepl.LSN, error) {
	conn, done, err := writer(ctx, src, primaryURL)
	if err != nil {
		return 0, err
	}
	defer done()
	return cdc.CurrentLSN(ctx, conn)
}

// dropPublication drops publication name on the source, or on its primary when the source is a
// standby (writer).
func dropPublication(ctx context.Context, src *pgx.Conn, primaryURL, name string) error {
	conn, done, err := writer(ctx, src, primaryURL)
	if err != nil {
		return err
	}
	defer done()
	if _, err := conn.Exec(ctx, "drop publication if exists "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("drop publication %q: %w", name, err)
	}
	return nil
}

// sequenceSource returns the URL the cutover reads sequence values from: the source's, or its
// primary's when the source is a standby, whose sequences lag the primary's (writer).
func sequenceSource(ctx context.Context, src *pgx.Conn, sourceURL, primaryURL string) (string, error) {
	standby, err := cdc.InRecovery(ctx, src)
	switch {
	case err != nil:
		return "", err
	case !standby:
		return sourceURL, nil
	case primaryURL == "":
		return "", errStandbyNeedsPrimary
	}
	return primaryURL, nil
}

// waitWritten waits (up to 30 s each) until the slot can decode every transaction committed so
// far: until the source has flushed the WAL it has written (cdc.WaitWALFlushed), and, when the
// source is a standby, until the primary has and the standby has replayed it (cdc.WaitReplayed),
// so that writes the primary took are not missed for not having reached the standby yet.
func waitWritten(ctx context.Context, src *pgx.Conn, primaryURL string) error {
	conn, done, err := writer(ctx, src, primaryURL)
	if err != nil {
		return err
	}
	defer done()
	if err := cdc.WaitWALFlushed(ctx, conn, 30*time.Second); err != nil || conn == src {
		return err
	}
	at, err := cdc.CurrentLSN(ctx, conn)
	if err != nil {
		return err
	}
	return cdc.WaitReplayed(ctx, src, at, 30*time.Second)
}
