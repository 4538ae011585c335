package processor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

func TestProcessorOptions(t *testing.T) {
	t.Parallel()
	mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	ok := func(context.Context, leasing.Lease) error { return nil }

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		p, err := processor.New(mem, ok, processor.Options{})
		require.NoError(t, err)
		o := p.Options()
		require.Equal(t, 100, o.BatchSize)
		require.Equal(t, 30*time.Second, o.LeaseDuration)
		require.Equal(t, 10*time.Second, o.HeartbeatInterval)
		require.Equal(t, 64, o.Concurrency)
		require.Equal(t, time.Second, o.PollInterval)
		require.Equal(t, 10*time.Second, o.ShutdownGrace)
		require.Equal(t, time.Minute, o.HandlerTimeout)
		require.Equal(t, processor.DefaultHandlerTimeout, o.HandlerTimeout)
		require.Equal(t, processor.RetryPolicy{MaxAttempts: 24, InitialDelay: time.Second, MaxDelay: 5 * time.Minute, Multiplier: 2}, o.RetryPolicy)
		require.Equal(t, processor.BreakerPolicy{Threshold: 5, ProbeInterval: time.Second, MaxProbeInterval: 30 * time.Second}, o.Breaker)
		require.True(t, strings.HasPrefix(p.Owner(), "inbox-"), p.Owner())

		q, err := processor.New(mem, ok, processor.Options{Owner: "billing"})
		require.NoError(t, err)
		r, err := processor.New(mem, ok, processor.Options{Owner: "billing"})
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(q.Owner(), "billing-"), q.Owner())
		require.NotEqual(t, q.Owner(), r.Owner(), "one label, two owners")

		none, err := processor.New(mem, ok, processor.Options{HandlerTimeout: processor.NoHandlerTimeout})
		require.NoError(t, err, "NoHandlerTimeout turns the timeout off")
		require.Equal(t, processor.NoHandlerTimeout, none.Options().HandlerTimeout)

		label := strings.Repeat("o", leasing.MaxOwnerLabelBytes)
		long, err := processor.New(mem, ok, processor.Options{Owner: label})
		require.NoError(t, err, "the longest label is kept whole")
		require.True(t, strings.HasPrefix(long.Owner(), label+"-"), long.Owner())
		require.Len(t, long.Owner(), leasing.MaxOwnerBytes)
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			store leasing.Store
			h     processor.Handler
			opts  processor.Options
			field string
		}{
			"NilStore":                 {nil, ok, processor.Options{}, "store"},
			"NilHandler":               {mem, nil, processor.Options{}, "handler"},
			"NilStoreAndHandler":       {nil, nil, processor.Options{}, "store"},
			"HeartbeatOverHalfLease":   {mem, ok, processor.Options{LeaseDuration: 10 * time.Second, HeartbeatInterval: 5*time.Second + 1}, "heartbeat interval"},
			"NegativeHeartbeat":        {mem, ok, processor.Options{HeartbeatInterval: -time.Second}, "heartbeat interval"},
			"NegativeBatchSize":        {mem, ok, processor.Options{BatchSize: -1}, "batch size"},
			"BatchSizeOverMax":         {mem, ok, processor.Options{BatchSize: leasing.MaxBatchSize + 1}, "batch size"},
			"NegativeLease":            {mem, ok, processor.Options{LeaseDuration: -time.Second}, "lease duration"},
			"LeaseOverMax":             {mem, ok, processor.Options{LeaseDuration: leasing.MaxLeaseDuration + time.Second}, "lease duration"},
			"NegativeConcurrency":      {mem, ok, processor.Options{Concurrency: -4}, "concurrency"},
			"NegativePollInterval":     {mem, ok, processor.Options{PollInterval: -time.Second}, "poll interval"},
			"NegativeShutdownGrace":    {mem, ok, processor.Options{ShutdownGrace: -time.Second}, "shutdown grace"},
			"NegativeHandlerTimeout":   {mem, ok, processor.Options{HandlerTimeout: -time.Second}, "handler timeout"},
			"HandlerTimeoutMinusTwo":   {mem, ok, processor.Options{HandlerTimeout: -2}, "handler timeout"},
			"OwnerWithNUL":             {mem, ok, processor.Options{Owner: "a\x00b"}, "owner"},
			"OwnerWithAt":              {mem, ok, processor.Options{Owner: "relay@a"}, "owner"},
			"OwnerTooLong":             {mem, ok, processor.Options{Owner: strings.Repeat("o", leasing.MaxOwnerBytes)}, "owner"},
			"OwnerLabelOneTooLong":     {mem, ok, processor.Options{Owner: strings.Repeat("o", leasing.MaxOwnerLabelBytes+1)}, "owner"},
			"RetryMaxAttemptsNegative": {mem, ok, processor.Options{RetryPolicy: processor.RetryPolicy{MaxAttempts: -1}}, "retry max attempts"},
			"RetryMultiplierBelowOne":  {mem, ok, processor.Options{RetryPolicy: processor.RetryPolicy{Multiplier: 0.5}}, "retry multiplier"},
			"RetryJitterOverOne":       {mem, ok, processor.Options{RetryPolicy: processor.RetryPolicy{Jitter: 1.5}}, "retry jitter"},
			"RetryMaxBelowInitial":     {mem, ok, processor.Options{RetryPolicy: processor.RetryPolicy{InitialDelay: time.Hour, MaxDelay: time.Minute}}, "retry max delay"},
			"RetryNegativeInitial":     {mem, ok, processor.Options{RetryPolicy: processor.RetryPolicy{InitialDelay: -time.Second}}, "retry initial delay"},
			"RetryInitialOverMax":      {mem, ok, processor.Options{RetryPolicy: processor.RetryPolicy{InitialDelay: leasing.MaxDelay + 1}}, "retry initial delay"},
			"RetryMaxOverMax":          {mem, ok, processor.Options{RetryPolicy: processor.RetryPolicy{MaxDelay: leasing.MaxDelay + 1}}, "retry max delay"},
			"BreakerThresholdNegative": {mem, ok, processor.Options{Breaker: processor.BreakerPolicy{Threshold: -1}}, "breaker threshold"},
			"BreakerProbeNegative":     {mem, ok, processor.Options{Breaker: processor.BreakerPolicy{ProbeInterval: -time.Second}}, "breaker probe interval"},
			"BreakerMaxBelowProbe": {mem, ok, processor.Options{Breaker: processor.BreakerPolicy{ProbeInterval: time.Minute, MaxProbeInterval: time.Second}},
				"breaker max probe interval"},
			"TenantWithNUL":          {mem, ok, processor.Options{TenantID: "t\x00"}, "tenant id"},
			"TenantInvalidUTF8":      {mem, ok, processor.Options{TenantID: "\xff"}, "tenant id"},
			"TopicEmpty":             {mem, ok, processor.Options{Topics: []string{""}}, "topics"},
			"VacuumNegativeDeadRows": {mem, ok, processor.Options{Vacuum: processor.VacuumPolicy{DeadRows: -1}}, "vacuum dead rows"},
			"VacuumNegativeInterval": {mem, ok, processor.Options{Vacuum: processor.VacuumPolicy{CheckInterval: -time.Second}}, "vacuum check interval"},
			"VacuumDutyCycleOverOne": {mem, ok, processor.Options{Vacuum: processor.VacuumPolicy{DutyCycle: 1.5}}, "vacuum duty cycle"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				p, err := processor.New(tc.store, tc.h, tc.opts)
				require.Nil(t, p)
				require.ErrorIs(t, err, leasing.ErrInvalidArgument)
				var argErr *leasing.ArgumentError
				require.ErrorAs(t, err, &argErr)
				require.Equal(t, tc.field, argErr.Field)
			})
		}
	})
}
