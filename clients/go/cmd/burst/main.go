// Command burst opens many InferStream calls at once on one connection, as a
// gateway or an application server multiplexing its users does, and prints how
// they ended: one JSON object of status code -> count.
//
// Usage: burst [-streams N] [-max-tokens N] [host:port] [model]
//
// Each call is plaintext and has a 5-minute deadline. The server answers a
// call it cannot take now from its admission queue (OK once it has run, or
// RESOURCE_EXHAUSTED with RetryInfo), never with an HTTP/2 refusal.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	inferwirev1 "github.com/inferwire/inferwire/clients/go/inferwire/v1"
)

func main() {
	streams := flag.Int("streams", 1000, "calls opened at once")
	maxTokens := flag.Int("max-tokens", 16, "tokens each call asks for")
	flag.Parse()
	target, model := "localhost:50051", "demo"
	if flag.NArg() > 0 {
		target = flag.Arg(0)
	}
	if flag.NArg() > 1 {
		model = flag.Arg(1)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "burst:", err)
		os.Exit(1)
	}
	defer conn.Close()
	client := inferwirev1.NewInferenceServiceClient(conn)
	tokens := int32(*maxTokens)
	request := &inferwirev1.InferStreamRequest{
		Model:      model,
		Prompt:     "ROMEO:",
		Parameters: &inferwirev1.GenerationParameters{MaxTokens: &tokens},
	}

	var mu sync.Mutex
	codes := map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < *streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := run(client, request)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(codes); err != nil {
		fmt.Fprintln(os.Stderr, "burst:", err)
		os.Exit(1)
	}
}

// run makes one call, reads it to its end and returns the code's name.
func run(client inferwirev1.InferenceServiceClient, request *inferwirev1.InferStreamRequest) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream, err := client.InferStream(ctx, request)
	for err == nil {
		_, err = stream.Recv()
	}
	if errors.Is(err, io.EOF) {
		return "OK"
	}
	return status.Code(err).String()
}
