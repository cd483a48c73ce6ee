//! How acknowledgements are authenticated: by the token of the pod's open stream, without a
//! TokenReview (issue 35: a connected fleet's acks never make a burst of reviews), else by a
//! review.

use super::*;

fn acks_authenticated(via: &str) -> String {
    format!("lifeguard_operator_acknowledgement_authentications_total{{via=\"{via}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_presenting_its_open_streams_token_needs_no_token_review() {
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report"))
        .await;
    let streaming =
        TestPod::create(&emulator, NS, "reports-0", &[("app", "reports")], "reports").await;
    let without_stream =
        TestPod::create(&emulator, NS, "reports-1", &[("app", "reports")], "reports").await;
    let stream = RawStream::open(&operator, &streaming, |s| s["policy"].is_object()).await;
    let ack = stream.genuine_ack(0);
    let reviews = emulator.token_reviews().await.len();
    assert!(reviews >= 1, "the stream was opened after a review");

    for _ in 0..3 {
        let (status, body) = post_ack(&operator, &streaming, &ack).await;
        assert_eq!(status, 204, "{body}");
    }
    assert_eq!(emulator.token_reviews().await.len(), reviews);
    assert_eq!(
        operator.metric(&acks_authenticated("stream_token")).await,
        Some(3.0)
    );
    // The review made when the stream opened vouches for its token while the stream is open
    // (at most until the token expires): an API server that would no longer accept the token
    // is not asked.
    emulator.remove_token(&streaming.token).await;
    let (status, body) = post_ack(&operator, &streaming, &ack).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(emulator.token_reviews().await.len(), reviews);

    // A token that opened no stream here is reviewed, and its ack refused: no stream.
    let (status, body) = post_ack(&operator, &without_stream, &ack).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(emulator.token_reviews().await.len(), reviews + 1);
    assert_eq!(
        operator.metric(&acks_authenticated("token_review")).await,
        Some(1.0)
    );
    // So is a garbage token, refused by the API server before the body is read.
    let forged = TestPod {
        namespace: streaming.namespace.clone(),
        name: streaming.name.clone(),
        uid: streaming.uid.clone(),
        token: "forged".into(),
    };
    let (status, body) = post_ack(&operator, &forged, &ack).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(emulator.token_reviews().await.len(), reviews + 2);

    // Once the stream is closed, its token vouches for nothing: the ack goes to the review
    // path (the stream's own review may still be cached: 409, no stream; else the API server
    // refuses the removed token: 401).
    drop(stream);
    eventually(WAIT, async || {
        let open = operator
            .metric("lifeguard_operator_sidecars_connected")
            .await;
        (open == Some(0.0)).then_some(())
    })
    .await
    .expect("the operator saw the stream close");
    let (status, body) = post_ack(&operator, &streaming, &ack).await;
    assert!(matches!(status, 401 | 409), "{status} {body}");
    assert_eq!(
        operator.metric(&acks_authenticated("stream_token")).await,
        Some(4.0)
    );
}
