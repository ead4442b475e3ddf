package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func quotaError(t *testing.T, delay time.Duration) error {
	t.Helper()
	st, err := status.New(codes.ResourceExhausted, "tenant over quota").WithDetails(
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{
			{Subject: "tenant:t", Description: "requests_per_minute exceeded"},
		}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)},
	)
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestRetryAfterReadsRetryInfoOfResourceExhaustedOnly(t *testing.T) {
	if delay, ok := retryAfter(quotaError(t, 1500*time.Millisecond)); !ok || delay != 1500*time.Millisecond {
		t.Fatalf("got %v %v, want 1.5s true", delay, ok)
	}
	if _, ok := retryAfter(status.Error(codes.ResourceExhausted, "queue full")); ok {
		t.Fatal("no RetryInfo: no retry")
	}
	if _, ok := retryAfter(status.Error(codes.InvalidArgument, "bad")); ok {
		t.Fatal("INVALID_ARGUMENT: no retry")
	}
	if _, ok := retryAfter(nil); ok {
		t.Fatal("nil: no retry")
	}
}

func TestWithQuotaRetriesWaitsAndStopsAfterTheAttempts(t *testing.T) {
	calls := 0
	err := withQuotaRetries(context.Background(), 3, func() error {
		calls++
		if calls < 2 {
			return quotaError(t, time.Millisecond)
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("got %v after %d calls, want success after 2", err, calls)
	}
	calls = 0
	err = withQuotaRetries(context.Background(), 3, func() error {
		calls++
		return quotaError(t, time.Millisecond)
	})
	if status.Code(err) != codes.ResourceExhausted || calls != 3 {
		t.Fatalf("got %v after %d calls, want RESOURCE_EXHAUSTED after 3", err, calls)
	}
	other := errors.New("not a status")
	if err := withQuotaRetries(context.Background(), 3, func() error { return other }); err != other {
		t.Fatalf("got %v", err)
	}
}
