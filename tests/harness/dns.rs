//! A stub DNS server for tests: the receive–parse–reply loop once, what each reply holds left
//! to the test that runs it.

use hickory_proto::op::{Message, MessageType};
use tokio::net::UdpSocket;

/// Answers every query that arrives on `socket`, for as long as the task runs. Each reply
/// echoes the request's id, op code and questions; `answer` fills in the rest (answers,
/// response code) from the request. Datagrams that do not parse as DNS are dropped.
pub async fn serve(socket: UdpSocket, mut answer: impl FnMut(&Message, &mut Message)) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(request) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
        reply.metadata.message_type = MessageType::Response;
        reply.add_queries(request.queries.iter().cloned());
        answer(&request, &mut reply);
        let _ = socket.send_to(&reply.to_vec().unwrap(), peer).await;
    }
}
