# The official script (openrlhf_rm_llama3_8b.sh) on 6 x RTX 4090 after OpenRLHF issue #354's advice (conf/recipe/
# openrlhf_rm_llama3_8b_4090.yaml): the issue's --train_batch_size 126 and --lora_rank 64 --lora_alpha 64, the
# maintainer's max_len 4096, ZeRO-2 per the follow-up write-up (../shared/reference/openrlhf.md §1d).
deepspeed --module openrlhf.cli.train_rm \
   --save_path ./checkpoint/llama3-8b-rm \
   --save_steps -1 \
   --logging_steps 1 \
   --eval_steps -1 \
   --train_batch_size 126 \
   --micro_train_batch_size 1 \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --bf16 \
   --max_epochs 1 \
   --max_len 4096 \
   --zero_stage 2 \
   --learning_rate 9e-6 \
   --dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku \
   --apply_chat_template \
   --chosen_key chosen \
   --rejected_key rejected \
   --attn_implementation flash_attention_2 \
   --packing_samples \
   --load_checkpoint \
   --gradient_checkpointing \
   --lora_rank 64 \
   --lora_alpha 64
