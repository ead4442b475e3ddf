// Command embed calls Embed on a running inferwire server through the generated
// Go client and prints the answer as one JSON object: the model, the prompt
// tokens and each input's embedding. With -rerank QUERY it calls Rerank
// instead, the inputs as the documents, and prints the results in order.
//
// Usage: embed [-rerank QUERY] host:port model text...
//
// Each call is plaintext and has a 1-minute deadline. An error prints its gRPC
// code and message on standard error and exits 1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	inferwirev1 "github.com/inferwire/inferwire/clients/go/inferwire/v1"
)

type rerankResult struct {
	Index uint32  `json:"index"`
	Score float32 `json:"relevance_score"`
}

func main() {
	query := flag.String("rerank", "", "rank the texts as documents for this query (Rerank)")
	flag.Parse()
	if flag.NArg() < 3 {
		fmt.Fprintln(os.Stderr, "usage: embed [-rerank QUERY] host:port model text...")
		os.Exit(2)
	}
	target, model, texts := flag.Arg(0), flag.Arg(1), flag.Args()[2:]
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := inferwirev1.NewInferenceServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out any
	if *query != "" {
		reply, err := client.Rerank(ctx, &inferwirev1.RerankRequest{Model: model, Query: *query, Documents: texts})
		if err != nil {
			fail(err)
		}
		results := []rerankResult{}
		for _, r := range reply.GetResults() {
			results = append(results, rerankResult{r.GetIndex(), r.GetRelevanceScore()})
		}
		out = map[string]any{"model": reply.GetModel(), "results": results}
	} else {
		reply, err := client.Embed(ctx, &inferwirev1.EmbedRequest{Model: model, Inputs: texts})
		if err != nil {
			fail(err)
		}
		embeddings := [][]float32{}
		for _, e := range reply.GetEmbeddings() {
			embeddings = append(embeddings, e.GetValues())
		}
		out = map[string]any{
			"model":         reply.GetModel(),
			"prompt_tokens": reply.GetUsage().GetPromptTokens(),
			"embeddings":    embeddings,
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

func fail(err error) {
	if s, ok := status.FromError(err); ok {
		fmt.Fprintf(os.Stderr, "%s: %s\n", s.Code(), s.Message())
	} else {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(1)
}
