package spantest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/spantest"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	p := spantest.NewProvider()
	tr := p.Tracer("test")
	_, once := tr.Start(context.Background(), "once")
	once.End()
	require.NoError(t, p.Check())

	_, twice := tr.Start(context.Background(), "twice")
	twice.End()
	twice.End()
	_, never := tr.Start(context.Background(), "never")
	err := p.Check()
	require.ErrorContains(t, err, `"twice" ended 2 times`)
	require.ErrorContains(t, err, `"never" ended 0 times`)
	require.Len(t, p.Named("twice"), 1, "a second End records nothing")
	never.End()
}
